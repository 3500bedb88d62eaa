"""Runnable examples (README "Use your own model, data and captures"); each is also run small by the tests."""
