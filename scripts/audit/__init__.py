"""The mutation audit's survival rates."""
