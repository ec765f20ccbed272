/* The cluster integration tests again, with a TP4 prefill group and a TP4 decode group (four
 * processes each, ranks over loopback sockets), plus kill -9 of a non-leader rank and a request
 * that reaches the prefill leader during its idle heartbeat. */
#define CLUSTER_TP 4
#include "integration/test_cluster.c"
