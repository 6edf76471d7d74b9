"""The ``pykvpool report`` document: :mod:`~pykvpool.report.build` (the sections),
:mod:`~pykvpool.report.tables`, :mod:`~pykvpool.report.figures`, :mod:`~pykvpool.report.article`
(the article's numbers), :mod:`~pykvpool.report.dynamic` (the simulator section)."""
