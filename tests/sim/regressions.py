SEEDS: list[tuple[int, str]] = []
