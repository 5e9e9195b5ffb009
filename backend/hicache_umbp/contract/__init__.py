"""The env contract shared by the operator, the launcher and the store: settings, parsing, units,
names and paths, and the pure formulas both sides size with. Standard library only."""
