"""Adapters: learners and integrations that train policies on collab_env environments
(installed as ``collab_env.adapters``)."""
