"""Runnable examples (docs/usage.md "Your own model, data and captures"); each is also run small by the tests."""
