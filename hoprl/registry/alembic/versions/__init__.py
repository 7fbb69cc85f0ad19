"""Registry migrations, one module per revision; Alembic skips this file."""
