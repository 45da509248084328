"""PostgreSQL projections: schema migrations and the projector."""
