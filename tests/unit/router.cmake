if(TARGET pdserve_router)
  pdserve_add_test(router_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/router_test.cc
    LIBS pdserve_router)
endif()
if(TARGET pdserve_router)
  pdserve_add_test(timer_queue_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/timer_queue_test.cc
    LIBS pdserve_router)
endif()
if(TARGET pdserve_router)
  pdserve_add_test(http_server_test
    SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/http_server_test.cc
    LIBS pdserve_router)
endif()
