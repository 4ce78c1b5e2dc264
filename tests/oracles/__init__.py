"""Independent replays the tests compare the engine and the package against: written apart from the code they
check, so that a shared mistake cannot pass unseen."""
