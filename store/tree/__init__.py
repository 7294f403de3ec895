"""Trees of a page's versions: the B-tree, commits, dots (versions and contexts), joins and
merge policies."""
