from localcluster import Client, LocalCluster


def inc(x):
    return x + 1


def test_submit_result(client):
    assert client.submit(inc, 1).result(timeout=10) == 2


def test_map_gather(client):
    assert client.gather(client.map(inc, range(100))) == list(range(1, 101))
