package cluster_test

import (
	"testing"

	"ticketing/cluster"
)

// Replication is never pipelined: hashicorp/raft's AppendEntries pipeline
// can wedge replication to a follower whose append failed, and hang the
// node's shutdown (seen in CI, parked in netPipeline.AppendEntries).
func TestReplicationIsNotPipelined(t *testing.T) {
	c := startCluster(t, 3)
	for i := 0; i < c.Size(); i++ {
		if cluster.PipelinedReplication(c.Node(i)) {
			t.Fatalf("node %d replicates through a pipeline", i)
		}
	}
}
