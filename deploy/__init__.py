"""Deployment: the Helm chart (deploy/helm/flotilla) and the pinned helm that checks it."""
