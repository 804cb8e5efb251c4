"""Store schemas shared by the local stack and production's migration job."""
