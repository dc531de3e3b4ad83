"""A cluster of hosts on one machine: one Linux network namespace per host.

`evolving-infra testbed up` (cli/testbed/command.py) and the tests' fixture
(testing/netns_fixture.py) run on the same code: `plan` (names, addresses,
what UCX reports, pure), `netns` (namespaces, cables, teardown), `relay`
(Redis and PostgreSQL reachable from inside, the gateway from outside) and
`cluster` (workers and the gateway started inside their hosts).
"""
