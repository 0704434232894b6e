"""ReTool-style math with a Python interpreter."""
