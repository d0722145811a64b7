"""Tools for working on the repository (not part of the package): generators of checked files."""
