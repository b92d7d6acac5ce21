/* MPI_IN_PLACE is a C macro ((void *)-1 in MPICH, (void *)1 in Open MPI) that rsmpi's
   bindings leave out; this shim gives Rust the exact value of the library built against. */
#include <mpi.h>

void *gpt2rs_mpi_in_place(void) { return MPI_IN_PLACE; }
