// Lowered training steps in processes under mpirun: FSDP and DDP layouts of
// a small MLP step and of a tiny Llama's whole step on every rank of the
// world (2, 3 and 4 ranks; 3 gives uneven shards) match the single-rank run
// (tests/common/spmd_step_checks.h).
#include <gtest/gtest.h>

#include "mpi_world.h"
#include "spmd_step_checks.h"

TEST(SpmdMpi, FsdpStepMatchesOneRank) { EXPECT_EQ(mtest::check_lowered_step(mtest::mpi_world(), "S(0)"), 7); }

TEST(SpmdMpi, DdpStepMatchesOneRank) { EXPECT_EQ(mtest::check_lowered_step(mtest::mpi_world(), "R"), 7); }

TEST(SpmdMpi, LlamaStepFsdpMatchesOneRank) {
  EXPECT_EQ(mtest::check_llama_step(mtest::mpi_world(), mtest::fsdp()), mtest::kLlamaStepOutputs);
}

TEST(SpmdMpi, LlamaStepDdpMatchesOneRank) {
  EXPECT_EQ(mtest::check_llama_step(mtest::mpi_world(), mtest::ddp(mtest::mpi_world().size())),
            mtest::kLlamaStepOutputs);
}
