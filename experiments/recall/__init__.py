"""MQAR associative recall per mixer and setting (README.md)."""
