"""Alembic environment and migration scripts of the run registry (shipped with the package)."""
