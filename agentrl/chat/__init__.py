"""Model-family knowledge: chat templates, delta tokenization, tool-call and reasoning parsers."""
