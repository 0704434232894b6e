"""Bring-your-own agents trained with ``agentrl train --agent FILE.py:solve``."""
