"""`python -m rastro_fake_graph`: the demo world on loopback, under the rate limits chosen."""

from rastro_fake_graph.server import main

main()
