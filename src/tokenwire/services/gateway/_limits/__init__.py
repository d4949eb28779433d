"""Limits and budgets of keys and tenants, exact across the gateways of one broker (ADR 0042).

``limiter.py`` admits a call or refuses it (429 in the caller's dialect) and settles what it
used when it ends; ``leases.py`` holds this gateway's slices of the shared counters that
``tokenwire.broker.Allowances`` keeps in the broker; ``periods.py`` names the minutes, days
and months they count in; ``reservation.py`` prices a call's worst case.
"""
