"""Prefix-cache trace replay (:mod:`pykvpool.prefix.replay`)."""
