"""Infra tests: generated configs and the Pulumi program under mocks."""
