"""Proving the regression gate on a GPU, and the asv suite's bandwidth beside a sweep's."""
