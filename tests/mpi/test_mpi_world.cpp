// The MPI launch itself: every rank sees the same world and collectives agree. The parallel
// layer's own tests (communicators, TP/PP/DP equivalence) build on this harness.
#include <gtest/gtest.h>
#include <mpi.h>

TEST(MpiWorld, AllReduceSumsRanks) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long long mine = rank + 1, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, static_cast<long long>(size) * (size + 1) / 2);
}

TEST(MpiWorld, BroadcastFromRankZero) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  double value = rank == 0 ? 3.25 : -1.0;
  MPI_Bcast(&value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(value, 3.25);
}
