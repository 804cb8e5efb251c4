"""The abuse scorer (issue 13): voids, features, the model and its server."""
