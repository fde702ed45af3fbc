"""activities package."""
