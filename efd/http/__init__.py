"""The HTTP side: the server, its routes and what guards them."""
