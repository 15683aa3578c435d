"""Replicas of specframe serve behind Ray Serve: `serve run ray_serve_app:app` (pip install "ray[serve]").

Each replica is one Ray actor that loads the model and runs specframe's ASGI app, engine thread included; Ray
Serve's proxy spreads requests over the replicas (on one machine or a Ray cluster) and streams the responses.
"""

from ray import serve

from specframe.serve.builder import build_app


def specframe_app():
    """Run on each replica when it starts: load the model there and return the app."""
    return build_app("nemotron-stdlib-tiny", schedule="packed", width="auto", max_active=16, threads=1)


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1})
@serve.ingress(specframe_app)
class SpecframeReplica:
    """One specframe server (Ray Serve routes each request to one replica)."""


app = SpecframeReplica.bind()
