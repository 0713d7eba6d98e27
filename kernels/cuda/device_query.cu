// kernels/cuda/device_query.cu — device enumeration for `ctrain env` and backend selection.
// C ABI; every call is checked and failure means "no usable device" (the CPU backend runs).
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int ct_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
}

extern "C" int ct_cuda_device_info(int i, char *name, size_t name_cap, char *pci, size_t pci_cap,
                                   int *major, int *minor, size_t *mem_bytes) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) { cudaGetLastError(); return -1; }
  snprintf(name, name_cap, "%s", p.name);
  snprintf(pci, pci_cap, "%04x:%02x:%02x.0", p.pciDomainID, p.pciBusID, p.pciDeviceID);
  *major = p.major;
  *minor = p.minor;
  *mem_bytes = p.totalGlobalMem;
  return 0;
}

extern "C" void ct_cuda_versions(int *runtime, int *driver) {
  *runtime = 0;
  *driver = 0;
  cudaRuntimeGetVersion(runtime);
  cudaDriverGetVersion(driver);
}
