#include "core/tensor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core/allocator.h"
#include "core/copy.h"
#include "core/file_io.h"
#include "test_util.h"

using namespace meshtrain;

TEST(Shape, NumelDimAndErrors) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.to_string(), "(2, 3, 4)");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_THROW(s.dim(3), InvalidArgument);
  EXPECT_THROW((Shape{2, -1}), InvalidArgument);
  // More elements than memory can address: an error, not a wrapped count.
  EXPECT_THROW((Shape{1000000, 1000000, 1000000, 100}), InvalidArgument);
  EXPECT_THROW((Shape{int64_t{1} << 32, int64_t{1} << 32}), InvalidArgument);
  EXPECT_EQ((Shape{int64_t{1} << 40, 0}).numel(), 0);
  EXPECT_EQ((Shape{int64_t{1} << 28, int64_t{1} << 28}).numel(), int64_t{1} << 56);
  // --shape text: a dim of 2^40 is a dim, not "not an integer"; errors name the option.
  EXPECT_EQ(Shape::parse("1099511627776,2"), (Shape{int64_t{1} << 40, 2}));
  const auto message = [](const char* text) {
    try {
      Shape::parse(text, "--shape");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("8,-1"), "--shape '8,-1' has a negative size -1");
  EXPECT_NE(message("8, 2").find("cannot read --shape '8, 2': ' 2' is not an integer"), std::string::npos);
  EXPECT_NE(message("99999999999999999999").find("is not an integer below 2^63"), std::string::npos);
  EXPECT_NE(message("1000000,1000000,1000000,100").find("--shape '1000000,1000000,1000000,100': "), std::string::npos);
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  t.data<float>()[4] = 2.5f;
  EXPECT_EQ(t.get(4), 2.5);
  try {
    t.data<int32_t>();
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("data<i32>() on a tensor of dtype f32"), std::string::npos);
  }
  EXPECT_THROW(t.get(6), InvalidArgument);
  EXPECT_THROW(t.reshape({5}), InvalidArgument);
}

TEST(Tensor, TypedAccessToBf16) {
  Tensor t = Tensor::zeros({3}, DType::bf16);
  t.data<bfloat16>()[1] = f32_to_bf16(1.5f);
  EXPECT_EQ(t.get(1), 1.5);
  EXPECT_THROW(t.data<float>(), InvalidArgument);
  EXPECT_THROW(Tensor::zeros({3}, DType::f32).data<bfloat16>(), InvalidArgument);
}

TEST(Tensor, CloneIsIndependentAndCopiesShare) {
  Tensor a = Tensor::zeros({4}, DType::i64);
  Tensor shared = a;
  Tensor copy = a.clone();
  a.data<int64_t>()[0] = 7;
  EXPECT_EQ(shared.data<int64_t>()[0], 7);
  EXPECT_EQ(copy.data<int64_t>()[0], 0);
}

TEST(Tensor, ToConvertsWithRounding) {
  Tensor a = Tensor::empty({3}, DType::f32);
  a.set(0, 1.0);
  a.set(1, 1.00390625);  // halfway in bf16: ties to even -> 1.0
  a.set(2, 1000.0);
  Tensor b = a.to(DType::bf16);
  EXPECT_EQ(b.get(0), 1.0);
  EXPECT_EQ(b.get(1), 1.0);
  EXPECT_EQ(b.get(2), 1000.0);
  EXPECT_EQ(a.to(DType::f8e4m3).get(2), 448.0);  // saturates
}

TEST(CachingAllocator, StatsReuseAndRelease) {
  CachingAllocator alloc;
  void* a = alloc.allocate(1000);
  EXPECT_EQ(CachingAllocator::block_size(1000), 1024u);
  EXPECT_EQ(alloc.stats().current_bytes, 1024u);
  void* b = alloc.allocate(3 << 20);
  const size_t big = CachingAllocator::block_size(3 << 20);
  EXPECT_EQ(alloc.stats().peak_bytes, 1024u + big);
  alloc.deallocate(a);
  EXPECT_EQ(alloc.stats().current_bytes, big);
  EXPECT_EQ(alloc.stats().reserved_bytes, 1024u + big);
  void* c = alloc.allocate(900);  // same 1024-byte block from the cache
  EXPECT_EQ(c, a);
  EXPECT_EQ(alloc.stats().cache_hits, 1u);
  void* d = alloc.allocate(100);  // 512 B: the cache has nothing that small
  EXPECT_EQ(alloc.stats().cache_hits, 1u);
  alloc.deallocate(b);
  alloc.deallocate(d);
  alloc.release_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 1024u);  // only c is left
  EXPECT_EQ(alloc.stats().current_bytes, 1024u);
  alloc.deallocate(c);
  int on_stack = 0;
  EXPECT_THROW(alloc.deallocate(&on_stack), Error);
  alloc.release_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 0u);
  EXPECT_EQ(alloc.stats().allocations, 4u);
}

TEST(CachingAllocator, TensorsReturnBlocksToTheirAllocator) {
  CachingAllocator alloc;
  {
    Tensor t = Tensor::zeros({256}, DType::f32, alloc);
    EXPECT_EQ(alloc.stats().current_bytes, 1024u);
  }
  EXPECT_EQ(alloc.stats().current_bytes, 0u);
  Tensor u = Tensor::zeros({200}, DType::f32, alloc);
  EXPECT_EQ(alloc.stats().cache_hits, 1u);
}

// A file is written whole or not at all: until commit the old file stays as
// it was, an abandoned write leaves no temporary, and a path that cannot be
// created is an error naming it.
TEST(AtomicFile, WholeOrNothing) {
  const std::string path = ::testing::TempDir() + "/atomic_file_test.txt";
  write_file_atomically(path, "old");
  {
    AtomicFile file(path);
    file.write("new, unfinished");
    std::ifstream in(path);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "old");
  }  // abandoned
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  {
    std::ifstream in(path);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "old");
  }
  write_file_atomically(path, "new");
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  std::filesystem::remove(path);
  const std::string error = mtest::message_of([] { write_file_atomically("/nonexistent-dir/x.json", "{}"); });
  EXPECT_NE(error.find("writing /nonexistent-dir/x.json failed"), std::string::npos) << error;
}

// copy_bytes moves every byte, whatever the length (blocks of 64 and a
// tail) and the alignment of either end, and nothing past the end.
TEST(CopyBytes, EveryLengthAndAlignment) {
  std::vector<unsigned char> from(4096 + 200), to(4096 + 200);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{200}, size_t{4096}})
    for (size_t src_at : {0, 1, 8, 13})
      for (size_t dst_at : {0, 3, 8, 60}) {
        std::fill(to.begin(), to.end(), 0xAB);
        copy_bytes(to.data() + dst_at, from.data() + src_at, n);
        for (size_t i = 0; i < to.size(); ++i) {
          const bool inside = i >= dst_at && i < dst_at + n;
          ASSERT_EQ(to[i], inside ? from[i - dst_at + src_at] : 0xAB)
              << "n " << n << " from +" << src_at << " to +" << dst_at << " byte " << i;
        }
      }
}

// move_bytes where the ranges overlap, either way round, and where they do
// not: the result of a copy through a separate buffer, as memmove's.
TEST(CopyBytes, MoveBytesOverlappingEitherWay) {
  std::vector<unsigned char> start(1024);
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<unsigned char>(i * 37 + 11);
  for (size_t n : {size_t{1}, size_t{64}, size_t{100}, size_t{500}})
    for (size_t from_at : {0, 5, 300})
      for (size_t to_at : {0, 1, 64, 301, 500}) {
        std::vector<unsigned char> buf = start;
        const std::vector<unsigned char> piece(start.begin() + from_at, start.begin() + from_at + n);
        move_bytes(buf.data() + to_at, buf.data() + from_at, n);
        for (size_t i = 0; i < buf.size(); ++i) {
          const bool inside = i >= to_at && i < to_at + n;
          ASSERT_EQ(buf[i], inside ? piece[i - to_at] : start[i])
              << "n " << n << " from +" << from_at << " to +" << to_at << " byte " << i;
        }
      }
}
