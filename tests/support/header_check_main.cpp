// The header-check executable: the real test is that every generated TU (one public header each) compiled.
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int count = argc > 1 ? std::atoi(argv[1]) : 0;
  if (count <= 0) return 1;
  std::printf("%d headers compiled alone\n", count);
  return 0;
}
