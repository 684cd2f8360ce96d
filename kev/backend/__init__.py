"""The backend: the engine behind every front end, as the server and batch jobs hold it.

factory.py builds an EngineAPI for deploy.mode (an Engine, in-process replicas, or a cluster's RouterEngine) and
wraps it in an EngineBridge (bridge.py: the engine's calls off the event loop, its events into each request's Watch,
watch.py); metrics.py and vllm_metrics.py are the Prometheus series its results and steps feed.
"""
