"""What several tests share: a llama-server to test against, cache sizes that give a slot count, the package's
replays driven the way the tests compare them."""
