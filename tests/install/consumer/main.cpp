// A project outside the tree, built against the installed meshtrain package.
#include <meshtrain/comm/local_backend.h>
#include <meshtrain/core/tensor.h>

#include <cstdio>

int main() {
  using namespace meshtrain;
  comm::LocalWorld world(2);
  world.run([](comm::ProcessGroup& pg) {
    Tensor t = Tensor::empty({3}, DType::bf16);
    for (int i = 0; i < 3; ++i) t.set(i, pg.rank() + i);
    pg.all_reduce(t)->wait();
    if (t.get(2) != 5.0) throw Error("wrong all_reduce result");
  });
  std::printf("consumer: find_package(meshtrain) and an all_reduce on 2 ranks work\n");
  return 0;
}
