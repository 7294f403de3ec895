"""The registry of one document store per open page.

This module owns which :class:`~store.documents.documents.DocumentStore` an open page
has, and the lock that makes opening one (or closing it) a step of its own. What a
store does is :mod:`store.documents.documents`'s.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Generic, TypeVar

from ledgerd.store.page.page import Page

S = TypeVar("S")


class Registry(Generic[S]):
    """Each open page's store. A store refers to its page, so its key never dies on its
    own: the store leaves when it or its page closes (:meth:`forget`)."""

    def __init__(self) -> None:
        self._stores: weakref.WeakKeyDictionary[Page, S] = weakref.WeakKeyDictionary()
        self._opening: weakref.WeakKeyDictionary[Page, asyncio.Lock] = weakref.WeakKeyDictionary()

    def lock(self, page: Page) -> asyncio.Lock:
        """The lock that opening and closing ``page``'s store hold."""
        return self._opening.setdefault(page, asyncio.Lock())

    def get(self, page: Page) -> S | None:
        return self._stores.get(page)

    def put(self, page: Page, store: S) -> None:
        self._stores[page] = store

    def forget(self, page: Page, store: S) -> None:
        """``page`` no longer has ``store`` (if it still had it)."""
        if self._stores.get(page) is store:
            del self._stores[page]
