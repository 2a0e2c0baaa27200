"""The layout space: every [a2a, p2p] factorization of CP with its rank groups (``layout``),
which are kept or rejected and why (``plan``), and a user's Bridge config checked against
the rules (``validate``). Pure over the config; imports ``config``, ``upstream`` and the
contract.
"""
