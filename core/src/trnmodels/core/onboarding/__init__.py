"""Onboarding a model: the steps before a port (Step 0, the architecture diff, is ``diff``)."""
