"""Render Kubernetes manifests (kustomize base + overlays) for a baseline vs speculative A/B."""

from specserve.deploy.config import DeployConfig, DeployConfigError, load_deploy_config
from specserve.deploy.render import render, render_files

__all__ = ["DeployConfig", "DeployConfigError", "load_deploy_config", "render", "render_files"]
