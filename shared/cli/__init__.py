"""The `spotrain` command line; it never imports Ray, so it starts fast."""
