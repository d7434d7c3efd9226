"""A request's body to a checked turn request, each step once and in order: read (`read`, which
the server calls), parse (`parse`, with what the session's previous request shares, `memo`),
hold to the limits (`limits`), translate (`translate`); `reader` runs the steps after the
read."""
