"""The namespace-cluster tests: a package, so that its package-scoped clusters stop when its last test ends."""
