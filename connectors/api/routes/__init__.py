"""The REST API's routers, one module a resource; connectors/api/app.py assembles them."""
