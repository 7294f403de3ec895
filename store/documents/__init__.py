"""The document layer (after Yoda) on top of a page: layout, model, indexes, find, conflicts."""
