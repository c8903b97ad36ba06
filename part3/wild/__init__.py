"""part3.wild: the bug in the wild, in a room of its own. The lesson does not import it.

    incident.py          redis-py's cancelled-reply leak with the real library: the relay that
                         holds each reply, the scenario, its transcript (transcripts/wild.txt)
    __main__.py          `python3 -m part3.wild [--all | --table-row | --record]`
    table.py             `python3 -m part3.wild.table`: the scenario across redis-py releases
    requirements-*.txt   each pinned redis-py the Makefile puts in a venv of its own
    test_incident.py     the relay's claims, and the transcript byte for byte
"""
