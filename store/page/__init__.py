"""One page: reads, writes, transactions, watches, conflicts, garbage collection, checks and
the exchange of states with sync."""
