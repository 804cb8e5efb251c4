"""The Pulumi program: one ComponentResource per concern, plus generated configs."""
