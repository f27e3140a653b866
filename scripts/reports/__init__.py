"""Reports from sweep directories: targets judged, published figures compared, variants costed."""
