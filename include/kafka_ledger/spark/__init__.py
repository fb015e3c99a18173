"""Spark sessions: the Spark Connect client, and a session for either runtime."""
