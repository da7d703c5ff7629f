from tests.cluster.cluster import http, make_cluster

__all__ = ["http", "make_cluster"]
