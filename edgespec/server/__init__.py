"""`edgespec serve`: an OpenAI-compatible HTTP API over one loaded Engine.

`app` holds the routes, `schemas` the request/response shapes, `guard` who may call (Host, Origin,
content type), `worker` the one-generation-at-a-time scheduler, `run` the socket, connection
limits and signal handling. No llama_cpp and no Rich here: the Engine is the
only way to the models.
"""
