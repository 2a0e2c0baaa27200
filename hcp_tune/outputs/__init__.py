"""What users read: terminal tables (``ui``, rich), ``recommend``, ``regress`` and its views,
``report`` with the HTML page and its SVG plots. Reads what ``engine`` stored; never
measures. May import every layer below it.
"""
