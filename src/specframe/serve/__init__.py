"""``specframe serve``: an OpenAI-compatible HTTP server over specframe's decoders.

* :mod:`specframe.serve.protocol`: request validation, OpenAI response and chunk shapes, errors;
* :mod:`specframe.serve.engine`: the background thread that owns the decoders and steps requests;
* :mod:`specframe.serve.app`: the Starlette routes;
* :mod:`specframe.serve.metrics`: Prometheus text metrics;
* :mod:`specframe.serve.builder`: ``build_app(...)``, the app from plain options (for any ASGI host);
* :mod:`specframe.serve.cli`: the command (uvicorn, signals, defaults).

Starlette and uvicorn are the ``serve`` extra (``pip install "specframe[serve]"``); nothing here is imported by
``import specframe``.
"""
